// One-record transactions per second, by Kafka's own Java producer: each transaction
// begins, sends one record and commits, the next begun only once the commit returned.
// Kafka's load tools cannot express it (ProducerPerformance commits on elapsed time, at
// least 1 ms, so a transaction holds every record sent meanwhile), so the bench runs this
// on Kafka's classpath against both brokers: the same JVM program on each side.
//
// Arguments: bootstrap-servers topic transactions record-size
// Prints: "<n> transactions, <seconds> s, <n/s> transactions/s"

import java.util.Properties;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class OneRecordTransactions {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        byte[] value = new byte[Integer.parseInt(args[3])];
        java.util.Arrays.fill(value, (byte) 'A');

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "one-record-" + System.nanoTime());
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            // The first transaction finds the partition's leader and the coordinator: not timed.
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, value));
            producer.commitTransaction();
            long start = System.nanoTime();
            for (int i = 0; i < count; i++) {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(topic, value));
                producer.commitTransaction();
            }
            double seconds = (System.nanoTime() - start) / 1e9;
            System.out.printf("%d transactions, %.3f s, %.1f transactions/s%n", count, seconds, count / seconds);
        }
    }
}
