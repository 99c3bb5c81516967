import java.util.HashMap;
import java.util.Map;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.streams.StreamsConfig;

/**
 * What Kafka Streams does with group.protocol, on no broker: its default, a StreamsConfig
 * asking for the consumer protocol, and the main consumer given it. One JSON line. Run
 * from source (java -cp CLASSPATH StreamsGroupProtocol.java), outside the Maven build.
 */
public class StreamsGroupProtocol {
    public static void main(String[] args) {
        Map<String, Object> base = new HashMap<>();
        base.put("application.id", "app");
        base.put("bootstrap.servers", "localhost:9");
        String asked;
        try {
            Map<String, Object> props = new HashMap<>(base);
            props.put("group.protocol", "consumer");
            new StreamsConfig(props);
            asked = "accepted";
        } catch (ConfigException e) {
            asked = "ConfigException";
        }
        Map<String, Object> props = new HashMap<>(base);
        props.put("main.consumer.group.protocol", "consumer");
        props.put("consumer.group.protocol", "consumer");
        props.put("processing.guarantee", "exactly_once_v2");
        StreamsConfig config = new StreamsConfig(props);
        Object main = config.getMainConsumerConfigs("app", "client", 0).get("group.protocol");
        System.out.println("{\"default\": \"" + new StreamsConfig(base).getString("group.protocol")
            + "\", \"consumer\": \"" + asked + "\", \"main_consumer\": \"" + main + "\"}");
    }
}
